"""The privacy-utility simulator: tenants acting on no feed, the redacted feed, or everything."""
