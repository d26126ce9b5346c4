"""The rollout engine: tasks x samples x harness x model endpoint into scored trajectories (distillation, RL, eval)."""
