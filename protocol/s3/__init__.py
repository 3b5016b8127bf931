"""The S3 API's wire formats, pure: requests (addressing, operations, list parameters),
XML answers, and (``sigv4``, ``credentials``) request signatures."""
