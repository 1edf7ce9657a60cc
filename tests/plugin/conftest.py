"""The tuner plugin's fixtures (the built library, a prepared tuner directory), for every
file of the plugin's tests: they are defined beside the ABI tests, which import nothing."""

from tests.plugin.test_tuner_abi import lib, tuner_dir

__all__ = ["lib", "tuner_dir"]
