"""What watches the job: its output matched into progress, sd_notify, the GPUs through NVML,
torchrun's agent, and stack dumps read into each rank's top frames."""
