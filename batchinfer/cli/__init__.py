from batchinfer.cli.app import app

__all__ = ["app"]
