"""The EC2 capacity provider: real instances through boto3 (see README.md)."""
