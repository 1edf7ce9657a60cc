"""The tenant client: subscribe to the controller's feed."""

from harmonaize.tenant.client import FeedClient, FeedMessage

__all__ = ["FeedClient", "FeedMessage"]
