"""What a devnet accepts before it starts anything: the preset option."""

import pytest

from open1b.devnet import DevnetOptions


def test_a_devnet_trains_any_known_preset_but_scenarios_only_the_default():
    assert DevnetOptions(preset="gpt-125m", nodes=2, steps=3).preset == "gpt-125m"
    with pytest.raises(ValueError, match="unknown preset"):
        DevnetOptions(preset="gpt-7b")
    with pytest.raises(ValueError, match="scenarios train"):
        DevnetOptions(preset="small", scenarios=("crash",))
    assert DevnetOptions(scenarios=("crash",)).preset == "tiny"
