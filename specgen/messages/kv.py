"""A remote KV pool's messages. KvPoolStats and KvPoolResize are the frames of its control channel
(specgen.kv.pool_control, framed by specgen.wire like the actors' messages); KvPoolStats is also
embedded in what a job or the scheduler reports, and KvPoolView is the scheduler's view of a pool.
"""
from __future__ import annotations

from typing import ClassVar

import msgspec

from specgen.messages.frames import _Wire


class KvPoolStats(_Wire):
    """Size and effectiveness of one remote KV pool (specgen.kv.pool), for the scheduler."""

    KIND: ClassVar[int] = 35

    pool_id: str = ""                       # which pool (e.g. the engine's id)
    capacity_bytes: int = 0                 # pool memory held now, all devices
    used_bytes: int = 0                     # memory holding blocks (slots in use * slot size)
    slot_bytes: int = 0                     # one block's slot
    capacity_blocks: int = 0                # slots the pool can hold now
    used_blocks: int = 0                    # blocks held (complete or being stored)
    pinned_blocks: int = 0                  # blocks with a copy in flight (cannot be evicted)
    segments: int = 0                       # memory segments held
    bytes_by_device: dict[int, int] = {}    # pool memory per CUDA device; -1 is host memory
    hits: int = 0                           # looked-up blocks found complete
    misses: int = 0                         # looked-up blocks not found
    hit_rate: float = 0.0                   # hits / (hits + misses); 0 before any lookup
    stores: int = 0                         # blocks stored
    loads: int = 0                          # blocks loaded back
    evictions: int = 0                      # blocks dropped (LRU, to make room or to shrink)
    moves: int = 0                          # blocks relocated out of a shrinking segment
    shrinks: int = 0                        # segments given back
    grows: int = 0                          # segments added
    host: str = ""                          # host name of the pool's process (socket.gethostname())
    devices: list[int] = []                 # devices the pool's memory lives on (-1 host memory), even
                                            # when shrunk to nothing; host-wide GPU indices


class KvPoolResize(_Wire):
    """Scheduler/node -> a KV pool: change its size (a profiler needs memory, or has finished with it).

    The pool answers every resize with its KvPoolStats once the change is done (a shrink waits for
    copies in flight on the segments it gives back)."""

    KIND: ClassVar[int] = 36

    target_bytes: int | None = None         # new pool size; None only asks for stats
    request_id: str = ""                    # echoed in the log; lets the sender match the reply


class KvPoolView(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One remote KV pool as the scheduler sees it (SchedulerStats.kv_pools)."""

    pool: str                               # the pool's control-channel identity
    stats: KvPoolStats                      # its latest report
    reported_s_ago: float = 0.0             # age of that report
    paired_workers: list[str] = []          # workers on the same host and device(s)
    busy_devices: int = 0                   # paired devices running evaluations now
    restore_bytes: int | None = None        # size to grow back to while shrunk for evaluations
    target_bytes: int | None = None         # size last asked for (None: never resized)
    shrinks_requested: int = 0              # shrink requests the scheduler sent
    grows_requested: int = 0                # grow-back requests the scheduler sent
