"""trainer/planner package."""
