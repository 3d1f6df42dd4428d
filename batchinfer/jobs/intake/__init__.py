"""Intake, the first stage: a new batch is checked, stored and validated line by line into prepared requests."""
