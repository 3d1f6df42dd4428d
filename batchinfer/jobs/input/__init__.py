"""What a batch's input lines are, and how a file of them is validated."""
