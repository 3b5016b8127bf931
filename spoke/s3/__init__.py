"""The spoke's S3 front end: the S3 API on its own port over the same cache as /objects."""
