"""Variables: plain, mirrored, sync-on-read and aggregating (CentralStorage)."""
