"""Disputes: the op trace of a step, fraud proofs, and the referee (docs/protocol.md §18)."""
