"""What tests share and are not tests themselves: no `test_*.py` module imports another (tests/test_suite_rules.py)."""
