"""hivemux: a GPU cluster manager for deep learning.

The library every service imports: event models (`hivemux.events`), the topic registry
(`hivemux.topics`), the bus runtime (`hivemux.bus`), embedded infrastructure
(`hivemux.infra`), and the pure algorithms (`cells`, `health`, `sharing`, `matching`,
`prediction`, `sim`).
"""

__version__ = "0.1.0"
