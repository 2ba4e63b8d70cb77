"""payauth: card payment authorization from Kafka, exactly once in effect."""

__version__ = "0.1.0"
