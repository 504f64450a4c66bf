"""sd-scripts' pruning of old saves and states, written out from its train_util at the commit
tests/config/kohya_arguments.py names, as the independent answer for tests of ours."""

from __future__ import annotations


def sd_scripts_steps(every, last, last_state, saves):
    """What sd-scripts leaves after step saves at ``saves`` (train_util.get_remove_step_no and
    save_and_remove_state_stepwise): (step weights kept, step states kept)."""
    weights, states = set(), set()
    for step in saves:
        weights.add(step)
        states.add(step)
        if last is not None:
            gone = step - last - 1
            gone -= gone % every
            if gone >= 0:
                weights.discard(gone)
        keep_states = last_state if last_state else last
        if keep_states is not None:
            gone = step - keep_states - 1
            gone -= gone % every
            if gone > 0:
                states.discard(gone)
    return weights, states


def sd_scripts_epochs(every, last, last_state, saves):
    """The same for epoch saves (get_remove_epoch_no, save_and_remove_state_on_epoch_end)."""
    weights, states = set(), set()
    for epoch in saves:
        weights.add(epoch)
        states.add(epoch)
        if last is not None and epoch - every * last >= 0:
            weights.discard(epoch - every * last)
        keep_states = last_state if last_state else last
        if keep_states is not None:
            states.discard(epoch - every * keep_states)
    return weights, states
