"""A griffe extension for the API pages (mkdocs.yml): a module's public name bound to
another module's function (`poll = _adapter.poll`, as perseus.torch.mpi_ops does) is
documented as that function, with its signature and docstring. Read statically, it was
an attribute showing its internal value, and attributes head a module's page."""
import griffe


class ModuleAliases(griffe.Extension):
    def on_module_members(self, *, mod, **kwargs):
        for name, member in list(mod.members.items()):
            if name.startswith("_") or member.is_alias or not member.is_attribute:
                continue
            value = member.value
            # Only `module.name` where `module` is an import of this module.
            if (isinstance(value, griffe.ExprAttribute) and len(value.values) == 2
                    and isinstance(value.values[0], griffe.ExprName)
                    and value.values[0].name in mod.imports):
                mod.set_member(name, griffe.Alias(name, value.canonical_path, parent=mod))
