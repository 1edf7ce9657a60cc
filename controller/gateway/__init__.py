"""The HTTP gateway: the tenant feed as server-sent CloudEvents, and tenants' requests
over HTTP, beside the ZeroMQ feed and the same in every rule (docs/wire.md).

``events`` turns stored feed frames into CloudEvents and SSE text and reads cursors
(no I/O); ``tokens`` issues and checks tenants' bearer tokens in the controller's
database; ``sessions`` keeps browser sessions; ``bodies`` decodes request bodies within
bounds; ``connections`` admits connections and bounds how long they may take to ask;
``http`` is the aiohttp application the controller's shell runs on its loop.
"""
