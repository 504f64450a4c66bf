"""Model families: the registered families and what each of them is.

A family is one implementation of library.models.families.base.ModelFamily (its data and
behaviours), a loader that turns the user's files into Components, and an entry
(family_entry.FamilyEntry) that tells shared code, before anything loads, which models the
family claims, which config keys and kohya vocabulary it owns and what messages call it.
registry.FAMILIES lists the entries; family_choice asks them which family reads a model (SD
1.x/2.x/SDXL takes every model no other family claims, so its errors are the ones a user of an
unrecognised model sees).

Each family is a package here (sd/, flux/, sd3/, ...: its ModelFamily in family.py, its entry in
entry.py, its loaders and the rest it alone uses); the modules beside them are shared between
families. A new family adds its package and one line to registry.FAMILIES.

This package module imports nothing: the config schema asks the registry which network_module
values exist, and that must not load the families' loaders.
"""
