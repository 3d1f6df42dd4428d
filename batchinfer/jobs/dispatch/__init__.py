"""Dispatch, the second stage: pending requests planned into work units and routed to the workers' queues."""
