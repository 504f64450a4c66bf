"""LyCORIS adapters (LoCon, LoHa, LoKr, with DoRA) implemented by difftune.

``spec`` holds a run's network_args, ``layer`` the module that replaces one Linear/Conv2d,
``file_math`` the pure weight math of one saved module, ``factorize`` LoKr's dimension split.
The installed ``lycoris-lora`` package is only the reference the tests compare against.
"""
