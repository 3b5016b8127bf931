"""The S3 API's wire formats, pure: requests (addressing, operations, list parameters),
XML answers, SigV4 authentication and key files."""
