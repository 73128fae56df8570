"""python -m tensordb: the command line."""
from .cli import main

raise SystemExit(main())
