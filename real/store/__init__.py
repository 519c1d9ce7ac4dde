"""What the real backend keeps on disk: durable TITO logs and the micro-step queue.

- ``tito_log``: one append-only, fsync'd record log per execution
  (``ExecutionStore``); a crash loses nothing acknowledged;
- ``commit_journal``: the redo journal that lets ``group_commit.GroupCommit``
  make a batch of records of many logs durable with one ``fdatasync``;
- ``microstep_queue``: micro-step queues with atomic claims, in memory
  (threads) or on a directory (processes);
- ``cli``: ``gyre traj stats|show`` over recorded logs;
- ``durable``: ``fsync_path``, forcing a file's bytes or a folder's entries
  to disk (the record logs and the resume checkpoints use it).

May import: ``gyre`` (trajectory records, trees, packing) and
``gyre.analysis`` (the prefix-graph drawing); nothing heavy.
"""
