"""`specgen simulate`: a discrete-event run of many jobs on many GPUs that drives the project's own
scheduler core (SchedulerCore, its pools and priority rule) and the optimize loop's trigger gates,
fork model and termination criteria on a VirtualClock. See docs/simulate.md."""
