"""Plugins written in the tests as a user would write their own: each one module."""
