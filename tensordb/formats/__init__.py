"""File formats: tensors in from arrays and files, and out to files (docs/storage.md).

``load.load_tensor`` is the one entry for loads (numpy arrays, .npy, .npz, Parquet, CSV, SQL
queries, data frames, zarr, scipy.sparse and pydata sparse arrays), ``export.export_tensor`` for
exports (.npy, Parquet, CSV, zarr). ``npyfile`` and ``npzfile`` map or inflate arrays,
``tables`` streams DuckDB's Arrow batches (tables and COO tables), ``coo`` turns coordinate
entries into tiles and back (``con.sparse``), ``zarrio`` reads and writes zarr arrays chunk by
chunk, and ``filemeta`` is what an exported Parquet or CSV file records of its tensor. One tile
or one batch at a time: the memory a load or export may use is ``storage.budget``'s.

Every load ends in storage's writers (``storage.arrays.load_array``, ``TensorWriter``) and every
export reads storage's readers; SQL text a load or export runs passes the front door
(``sqlfront.guard``). Imports storage and sqlfront, and neither imports this package.
"""
