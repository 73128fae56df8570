"""The SQL front door: user SQL passed to DuckDB, and tensors and Python objects shown to it.

tensordb parses no SQL of its own: ``sqltext`` asks DuckDB's parser and binder what a piece of
text is (its statements, their types, the files a statement would write), ``guard`` decides from
that what user text may do (nothing writes inside the database directory; a query spliced into a
larger statement is exactly one SELECT), ``relations`` runs plain SQL over tables and tensors
(``con.sql``: a ``Relation`` with DuckDB's result methods), ``pyobjects`` shows Python objects
(registered ones, and the data frames a statement names in the caller's frame) to DuckDB, and
``suggest`` improves DuckDB's did-you-mean hints. The tensors themselves are shown to DuckDB by
``storage.views`` (the store owns the views it registers and refreshes them on commit).

Imports storage (the catalog connection, its lock and error translation) and nothing above it;
storage imports nothing of this package (setup.cfg's import contracts).
"""
