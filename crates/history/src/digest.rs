//! TL digests (being written: see the history issue's M2).
