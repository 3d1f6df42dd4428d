"""Batch events: written to the outbox with the batch's end, signed, and delivered."""
