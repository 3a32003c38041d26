"""plugin_utils.message: a stop's cause and fix, and the option rules the role filters share."""

from __future__ import annotations

from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.message import Message, option_problems

OPTION = Message("{name} is {value}; it must be {rule}.", "Fix it in the inventory.")
RULES = [
    ("demo_count", "a whole number of at least 1", lambda v: str(v).isdigit() and int(str(v)) >= 1),
    ("demo_path", "an absolute path", lambda v: str(v).startswith("/")),
]


def test_only_the_options_that_break_their_rule_are_named_in_rule_order():
    assert option_problems({"demo_count": 2, "demo_path": "/srv"}, RULES, OPTION) == []
    assert option_problems({"demo_path": "srv", "demo_count": 0}, RULES, OPTION) == [
        "demo_count is 0; it must be a whole number of at least 1. Fix it in the inventory.",
        "demo_path is srv; it must be an absolute path. Fix it in the inventory.",
    ]


def test_an_option_left_out_or_null_is_named_as_not_set():
    assert option_problems({"demo_path": "/srv"}, RULES, OPTION) == [
        "demo_count is not set; it must be a whole number of at least 1. Fix it in the inventory."
    ]
    assert option_problems({"demo_count": None, "demo_path": "/srv"}, RULES, OPTION)[0].startswith(
        "demo_count is not set;"
    )
