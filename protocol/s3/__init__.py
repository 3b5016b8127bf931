"""The S3 API's wire formats: SigV4 authentication, key files, XML, request parsing."""
