"""`python -m harness.run [overrides]` (or `harness-run`): the driver, harness/driver/app.py."""
from harness.driver.app import main

if __name__ == "__main__":
    main()
