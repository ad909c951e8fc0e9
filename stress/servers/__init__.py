"""Real servers on free loopback ports for the remote tiers' tests, benches and stress runs: redis-server
(`redis`) and moto's S3 service (`s3`)."""
