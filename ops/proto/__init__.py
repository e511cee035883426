"""Generated gRPC modules for the admin API (``make proto`` regenerates them from admin.proto)."""
