"""dflashd.trainer: the threaded DFlash drafter trainer, dflashd's embedded default job."""
