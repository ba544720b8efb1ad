"""The run registry: an embedded SQLite index of run directories, and what it answers.

In: run directories (`spade run`'s shard dirs and checkpoints). Out: a database
(`schema.py`), filled incrementally (`index.py`), queried for the lineage of an env, design,
checkpoint or eval (`lineage.py`) and exported as an env shard (`export.py`).
Guarantees: only complete shards are read; re-indexing unchanged runs changes nothing; a
lineage query is a handful of index seeks, whatever the size of the registry.
"""

from stages.registry.schema import connect, content_digest, default_db, row_counts

__all__ = ["connect", "content_digest", "default_db", "row_counts"]
