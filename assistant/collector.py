"""Python's garbage collector, kept out of the streams' way.

The collector stops the whole process while it runs, so every open stream waits for it. With
Python's defaults (a young collection every 700 new container objects, a full one every 100
young ones) a worker streaming to 150 students spent about 5 % of its core collecting, and each
full collection walked every object the process holds (Django, Twisted, the answers kept for a
resume: up to 150,000 of them) for 80-130 ms, longer than a token's whole budget of 50 ms.

``collector_settle`` is called once a worker has loaded everything (chatsite/asgi.py):

* ``gc.freeze()`` moves everything loaded at start-up (about 96,000 objects, which live as long
  as the process) out of the collector's reach, so a full collection walks only what serving
  made;
* the young generation is collected every ``threshold`` new objects instead of 700: most of an
  answer's objects are freed by reference counting long before that, so collections are about
  twenty times fewer and each one still short (about 2 ms per thousand live young objects).

What a collection frees is the same; only when it runs changes.
"""

import gc


def collector_settle(threshold: int) -> None:
    """Freeze what is loaded now and collect the young generation every ``threshold`` new
    objects; 0 leaves the collector as Python set it."""
    if threshold <= 0:
        return
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(threshold, middle, old)
