"""The search agent: one episode loop (agent.loop) for training, evaluation and `hexsearch ask`.

See docs/agent.md: action formats (agent.formats, agent.parser), token-space context and policies
(agent.context), rewards and the LLM judge (agent.rewards, agent.judge), trajectories (agent.trajectory).
"""
