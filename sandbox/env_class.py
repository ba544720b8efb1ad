"""Which class of an env module is the env, and proof that the class played is that class.

In: an env module's AST (`ast.parse` of its source); in the jail worker also its compiled code,
the namespace it ran in and the base class the worker injected.
Out: `env_class(tree)`, the one rule both the static checks (sandbox/contract.py `structure`)
and the worker (sandbox/worker.py `load`) use to pick the env class: exactly one top-level
`class` statement whose name ends in `Env` (`ToolUseBaseEnv` aside); none, or more than one, is
`EnvClassError`. `ancestry(tree, node)`: the env class's statement and those of the module
classes it inherits from; `class_bindings(node)`: the names a class body binds.
`shape_problem(tree, node)` and `import_time_patch(tree, name)`: the first way the module's
classes could make the class played differ from the class checked, as "what (line N)", or None.
`Guard`: run in the worker, the proof that what it plays is that class statement's class,
shaped by the same rules and unchanged (`Guard.check` after load and after every request).
Guarantees: one class, checked once, played always. The rules cover kinds, not known tricks:

  the shape (`shape_problem`, static; held again by `Guard` on what the module built): the env
  class and every class it inherits from are plain class statements of the module (bases are
  such classes, ToolUseBaseEnv or object: no imported class, none made by `type(...)`; no
  metaclass, no class keywords) and define none of CLASS_HOOKS (attribute lookup, construction,
  class-building hooks, slots, `__dict__`, `__class__`); no class of the module defines
  `__set_name__` (a descriptor handed the class being built); no code assigns, sets or deletes
  an object's `__class__` or `__dict__` (attribute targets, and setattr/delattr/`__setattr__`/
  `__delattr__` with those names as literals). Descriptors otherwise stay allowed: a property
  or a stdlib descriptor for an ordinary name is data to the checks, and none can stand in for
  a method the worker calls (next rule).
  the methods called (`Guard`, in the worker, after the module ran): every method the worker or
  the base class calls (`CALLED`, `tool_<name>`, the base's own) resolves through the MRO to
  the base's own, unchanged, or to the function its module class statement compiled under that
  very name, run in the module's namespace; with `sealed` names (our tool-use API's internals)
  no module class of a tool-use env holds one at all.
  the instance (`Guard.check(env)`, after every request): its type is still the env class (a
  computed `__class__` assignment, a constructor that built another class) and no attribute
  of its own hides a method of its class.
  nothing changed (`import_time_patch`, static; `Guard.check`, after every request): below.

What `import_time_patch` reads (static, never runs the code): module-level statements, class
bodies (they run at import), decorators and default values, and the bodies of module-level
functions and class methods that import-time code calls by name (transitively). It rejects an
assignment, augmented assignment or `del` whose target is an attribute or item of a top-level
class, of `ToolUseBaseEnv` or of a module-level alias of one (`MyEnv.step = ...`,
`MyEnv.step.__code__ = ...`, `ToolUseBaseEnv.reset.__globals__["x"] = ...`); `setattr`,
`delattr`, `object.__setattr__` and `type.__setattr__` on one; and any binding of the env
class's or `ToolUseBaseEnv`'s name besides the class statement (an assignment, `del`, import,
`def`, `global` declaration, or an item of `globals()`). What it cannot see: a class reached
through a parameter, a return value or a computed name (`def patch(cls): cls.step = f` used as
a decorator, `getattr(sys.modules[__name__], n)`), or changes made while the env plays. `Guard`
catches those at run time, for the env class, every class of the module in its MRO, and the
injected base class and its module's globals: a method whose code is not one its class
statement compiled, a name bound again, a base swapped, a method added, replaced or removed,
a function's code or defaults reassigned. It does not see a class attribute that is not a
function given another value through a computed path, or a stdlib module patched (`re`, `json`,
`random`): the jail bounds those, and the runtime checks play the env the worker plays. Nor can
it hold against an env that rewrites the worker itself (its classes, reached through
sys.modules or `object.__subclasses__()`, including this file's private copy): the worker is
not a security boundary, the jail is.

Stdlib only and self-contained: the worker runs a private copy of this file in the jail, taken
before any env code runs (the builtins it uses are bound here, so an env that patches builtins
misses them).
"""

import ast
from builtins import (Exception, any, callable, classmethod, dict, frozenset, getattr, id,
                      isinstance, len, list, min, next, object, property, set, sorted,
                      staticmethod, type, zip)
from types import CodeType, FunctionType, GetSetDescriptorType

BASE_NAME = "ToolUseBaseEnv"
SETTERS = ("setattr", "delattr")
DUNDER_SETTERS = ("__setattr__", "__delattr__")
_vars = type.__dict__["__dict__"].__get__  # a class's own namespace, whatever its metaclass says
_bases = type.__dict__["__bases__"].__get__
_mro = type.__dict__["__mro__"].__get__
_code = FunctionType.__code__.__get__
_defaults = FunctionType.__defaults__.__get__
_kwdefaults = FunctionType.__kwdefaults__.__get__
_name_of = type.__dict__["__name__"].__get__
_globals = FunctionType.__globals__.__get__
# What the worker and the base classes call on an env, besides tool_<name> and the base's own.
CALLED = ("__init__", "reset", "step", "solution", "setup", "close", "get_tools")


class EnvClassError(Exception):
    """The module has no env class, several, or one that is not what its statement defined."""


# -- the rule: which class is the env ----------------------------------------------------------

def env_class(tree):
    """The env class's statement: the one top-level `class` whose name ends in `Env`."""
    found = [node for node in tree.body if isinstance(node, ast.ClassDef)
             and node.name.endswith("Env") and node.name != BASE_NAME]
    if not found:
        if any(isinstance(node, ast.ClassDef) and node.name == BASE_NAME for node in tree.body):
            # small models name their env after the base class the prompt shows
            raise EnvClassError(f"no top-level class whose name ends in 'Env' but {BASE_NAME}, "
                                "the base class the jail injects: name the env "
                                f"`class <Name>Env({BASE_NAME})` and do not define {BASE_NAME}")
        raise EnvClassError("no top-level class whose name ends in 'Env'")
    if len(found) > 1:
        where = ", ".join(f"{node.name} (line {node.lineno})" for node in found)
        raise EnvClassError(f"{len(found)} top-level classes end in 'Env': {where}; define "
                            "exactly one, the env that is played, and give helper classes "
                            "other names")
    return found[0]


# -- static: the shape of the env's classes ----------------------------------------------------

# Names the env class and the module classes it inherits from may not define (a def, an
# assignment, any binding in the class body): each lets the class that is played differ from the
# class that was checked, and no text env needs one.
CLASS_HOOKS = frozenset({
    "__getattribute__", "__getattr__",  # attribute lookup decided by code: any method swapped
    "__new__",  # construction hands back an instance of another class
    "__init_subclass__", "__set_name__", "__class_getitem__",  # code run as classes are built
    "__slots__",  # storage outside the instance's __dict__, where a method can hide
    "__dict__", "__class__",  # what the instance's attributes and its type read as
})
# Names no class of the module may define, whatever it is for: a class with __set_name__ is a
# descriptor that is handed the class it is stored in, to change, while that class is built.
DESCRIPTOR_HOOKS = frozenset({"__set_name__"})
# What no code of the module may assign, set or delete on any object: its type and its
# attribute dict (an instance whose class changes after the checks is not the class checked).
IDENTITY_NAMES = frozenset({"__class__", "__dict__"})


def class_bindings(cls):
    """Names a class body binds (methods, nested classes and attributes), with their lines."""
    names = {}
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node.lineno
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node.lineno
    return names


def ancestry(tree, node):
    """The env class's statement, then the statements of the module classes it inherits from, as
    their bases name them (each once, nearest first)."""
    classes = {item.name: item for item in tree.body if isinstance(item, ast.ClassDef)}
    found, pending = [], [node]
    while pending:
        current = pending.pop(0)
        if any(current is seen for seen in found):
            continue
        found.append(current)
        pending.extend(classes[base.id] for base in current.bases
                       if isinstance(base, ast.Name) and base.id in classes)
    return found


def inherits_base(classes):
    """Whether one of these class statements names ToolUseBaseEnv among its bases."""
    return any(isinstance(base, ast.Name) and base.id == BASE_NAME
               for node in classes for base in node.bases)


def shape_problem(tree, node):
    """The first way the env's classes could make the class played differ from the class checked,
    as "what (line N)", or None. Rules: the env class and the module classes it inherits from
    are plain class statements (`base_problem`) that define none of CLASS_HOOKS; no class of the
    module defines DESCRIPTOR_HOOKS; and no code of the module assigns, sets or deletes
    IDENTITY_NAMES on any object (`identity_change`). Never runs the code."""
    statements = {}
    for item in tree.body:
        if isinstance(item, ast.ClassDef):
            statements[item.name] = statements.get(item.name, 0) + 1
    for cls in ancestry(tree, node):
        problem = base_problem(cls, statements) or hook_problem(cls, CLASS_HOOKS)
        if problem:
            return problem
    for cls in ast.walk(tree):
        problem = hook_problem(cls, DESCRIPTOR_HOOKS) if isinstance(cls, ast.ClassDef) else None
        if problem:
            return problem
    return identity_change(tree)


def base_problem(cls, statements):
    """Why a class of the env's ancestry is not a plain class statement, or None: it passes
    keywords (a metaclass), or names a base that is not one top-level class statement of the
    module, ToolUseBaseEnv or object (an imported class, a class made by type(...), an
    expression)."""
    if cls.keywords:
        keyword = cls.keywords[0]
        return (f"class {cls.name} passes {ast.unparse(keyword)} to its class statement: the env's "
                f"classes are plain classes, without a metaclass or class keywords "
                f"(line {cls.lineno})")
    for base in cls.bases:
        name = base.id if isinstance(base, ast.Name) else None
        if name in (BASE_NAME, "object") or statements.get(name) == 1:
            continue
        why = (f"{statements[name]} class statements define {name}" if name in statements else
               "it is not a class statement of this module, ToolUseBaseEnv or object")
        return (f"class {cls.name} inherits from {ast.unparse(base)}, and {why}: the env's "
                f"classes inherit only from classes written in the module (line {cls.lineno})")
    return None


def hook_problem(cls, hooks):
    """The first of `hooks` the class body binds, as "what (line N)", or None."""
    bound = class_bindings(cls)
    hooked = sorted(hooks & bound.keys())
    if not hooked:
        return None
    return (f"class {cls.name} defines {hooked[0]}, which lets the class that is played differ "
            f"from the class that is checked (line {bound[hooked[0]]})")


def identity_change(tree):
    """The first assignment, deletion, setattr or delattr of IDENTITY_NAMES anywhere in the
    module (a computed name is the worker's to catch, `Guard.check`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in IDENTITY_NAMES \
                and isinstance(node.ctx, (ast.Store, ast.Del)):
            verb = "deleted" if isinstance(node.ctx, ast.Del) else "assigned"
            return (f"{ast.unparse(node)} is {verb}: an object keeps the class and attributes it "
                    f"was built with (line {node.lineno})")
        if isinstance(node, ast.Call) and setter_name(node.func):
            for argument in node.args[:2]:
                if isinstance(argument, ast.Constant) and argument.value in IDENTITY_NAMES:
                    return (f"{setter_name(node.func)}(..., {argument.value!r}) changes an "
                            "object's class or attribute dict: an object keeps the ones it was "
                            f"built with (line {node.lineno})")
    return None


def setter_name(func):
    """`setattr`, `delattr`, `__setattr__` or `__delattr__` when `func` names one, else None."""
    if isinstance(func, ast.Name) and func.id in SETTERS:
        return func.id
    if isinstance(func, ast.Attribute) and func.attr in DUNDER_SETTERS:
        return func.attr
    return None


# -- static: what import-time code does to classes ---------------------------------------------

def import_time_patch(tree, env_name):
    """The first import-time change to a class, or rebinding of the env class's name, as
    "what (line N)"; None when there is none. Never runs the code."""
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)} | {BASE_NAME}
    aliases = dict.fromkeys(classes)
    changed = True
    while changed:  # `E = MyEnv` at module level makes E a class too
        changed = False
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases:
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id not in aliases:
                        aliases[target.id] = None
                        changed = True
    functions = {node.name: node for node in tree.body
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    methods = {(cls.name, item.name): item for cls in tree.body if isinstance(cls, ast.ClassDef)
               for item in cls.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
    protected = {env_name, BASE_NAME}
    for node in ast.walk(tree):  # a `global` declaration anywhere can rebind the env class
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                if name in protected:
                    return (f"'global {name}' lets a function rebind the env class "
                            f"(line {node.lineno})")
    pending, seen = list(tree.body), set()
    while pending:
        node = pending.pop(0)
        for part in import_time_nodes(node):
            problem = patch_in(part, aliases, protected)
            if problem:
                return f"{problem} (line {part.lineno})"
            called = called_at_import(part, functions, methods)
            for function in called:
                if id(function) not in seen:
                    seen.add(id(function))
                    pending.extend(function.body)
    for node in tree.body:  # top-level bindings of the env class's name other than its class
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in protected:
            return f"def {node.name} rebinds the env class's name (line {node.lineno})"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if (alias.asname or alias.name.partition(".")[0]) in protected:
                    return f"an import rebinds {alias.asname or alias.name} (line {node.lineno})"
    return None


def import_time_nodes(node):
    """`node` and what in it runs when it runs: a def's decorators, defaults and annotations but
    not its body; a class's bases, keywords, decorators and body."""
    stack = [node]
    while stack:
        child = stack.pop()
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield child  # its name is bound, and its decorators called, at import
            arguments = child.args
            runs = [*arguments.defaults, *(d for d in arguments.kw_defaults if d is not None)]
            if not isinstance(child, ast.Lambda):
                runs += [*child.decorator_list, *(a.annotation for a in (
                    *arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)
                    if a.annotation is not None)]
            stack.extend(runs)
            continue
        yield child
        stack.extend(ast.iter_child_nodes(child))


def root_name(node):
    """The name an attribute/item chain starts from: `MyEnv` for `MyEnv.step.__code__`,
    `getattr(MyEnv, "step").x` and `vars(MyEnv)["step"]`."""
    while True:
        if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "vars") and node.args:
            node = node.args[0]
        else:
            return node.id if isinstance(node, ast.Name) else None


def is_globals(node):
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
        and node.func.id in ("globals", "vars") and not node.args


def patch_in(node, classes, protected):
    """What this one node does to a class, or None."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = node.targets
    elif isinstance(node, ast.Call):
        setter = setter_name(node.func)
        if setter and node.args and root_name(node.args[0]) in classes:
            owner = ast.unparse(node.args[0])
            attribute = node.args[1] if len(node.args) > 1 else None
            if isinstance(attribute, ast.Constant) and isinstance(attribute.value, str):
                return f"{setter} at import replaces {owner}.{attribute.value}"
            return f"{setter} at import changes an attribute of {owner}"
        return None
    elif isinstance(node, (ast.Name, ast.NamedExpr)):
        name = node if isinstance(node, ast.Name) else node.target
        if isinstance(name.ctx, (ast.Store, ast.Del)) and name.id in protected:
            return f"{name.id} is bound again after its class statement"
        return None
    else:
        return None
    verb = "del" if isinstance(node, ast.Delete) else "module-level assignment"
    for target in targets:
        for part in target_parts(target):
            if isinstance(part, (ast.Attribute, ast.Subscript)) \
                    and root_name(part) in classes:
                return f"{verb} {'of' if verb == 'del' else 'replaces'} {ast.unparse(part)}"
            if isinstance(part, ast.Subscript) and is_globals(part.value):
                return f"{verb} through {ast.unparse(part)} rebinds a module name"
    return None


def target_parts(target):
    """The targets an assignment target binds: the elements of a tuple or list target."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [part for element in target.elts for part in target_parts(element)]
    if isinstance(target, ast.Starred):
        return target_parts(target.value)
    return [target]


def called_at_import(node, functions, methods):
    """Module-level functions and class methods `node` calls (or decorates with) by name."""
    names = []
    if isinstance(node, ast.Call):
        names.append(node.func)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        names.extend(node.decorator_list)
    found = []
    for name in names:
        if isinstance(name, ast.Call):
            name = name.func
        if isinstance(name, ast.Name) and name.id in functions:
            found.append(functions[name.id])
        elif isinstance(name, ast.Attribute) and isinstance(name.value, ast.Name) \
                and (name.value.id, name.attr) in methods:
            found.append(methods[name.value.id, name.attr])
    return found


# -- at run time, in the worker ----------------------------------------------------------------

def _parts(value):
    """What of a class attribute a patch could change: a function's code and defaults (through a
    staticmethod, classmethod or property too)."""
    kind = type(value)
    if kind is FunctionType:
        return (value, _code(value), _defaults(value), _kwdefaults(value))
    if kind is staticmethod or kind is classmethod:
        return (value, *_parts(value.__func__))
    if kind is property:
        return (value, *(part for f in (value.fget, value.fset, value.fdel) for part in _parts(f)))
    return (value,)


def _functions(value):
    """The plain functions behind a class attribute."""
    kind = type(value)
    if kind is FunctionType:
        return [value]
    if kind is staticmethod or kind is classmethod:
        return _functions(value.__func__)
    if kind is property:
        return [f for part in (value.fget, value.fset, value.fdel) for f in _functions(part)]
    return []


def _acts(value):
    """Whether a class attribute is behaviour rather than data: a function, a descriptor or
    anything callable (read from the type's own namespaces: no env code runs)."""
    if callable(value):
        return True
    return any("__get__" in _vars(kind) for kind in _mro(type(value)))


def _made_by_type(cls, key, value):
    """Whether `cls.<key>` is a `__dict__` or `__weakref__` slot type() gave the class itself
    (what a class statement gets without writing it)."""
    return key in ("__dict__", "__weakref__") and type(value) is GetSetDescriptorType \
        and value.__objclass__ is cls


def _same(first, second):
    if len(first) != len(second):
        return False
    for key, parts in first.items():
        other = second.get(key)
        if other is None or len(other) != len(parts):
            return False
        for a, b in zip(parts, other):
            if a is not b:
                return False
    return True


class Guard:
    """The worker's proof that the env class it plays is the one its class statement built.

    `Guard(tree, code, namespace, base, sealed)` is made before the module runs (`base` is the
    class the worker injects as ToolUseBaseEnv; `sealed`, the base's names no module class of a
    tool-use env may hold: our API's internals, none for the reference's); `loaded()` after,
    returning the env class or raising EnvClassError (no env class, several, one that is not
    its statement's or breaks the shape rules, or a called method that is not its def's);
    `check(env)` after every request, raising EnvClassError when a class it guards changed
    since, when the env is no longer an instance of the env class, or when it hides a method
    of its class behind an attribute of its own (`self.step = ...` in setup or reset)."""

    def __init__(self, tree, code, namespace, base, sealed=frozenset()):
        try:  # reported after the module runs, so its own errors come first, as they always did
            self.node, self.problem = env_class(tree), None
        except EnvClassError as exc:
            self.node, self.problem = None, exc
        self.tree, self.code, self.namespace, self.base = tree, code, namespace, base
        self.sealed = sealed
        base_globals = getattr(base.reset, "__globals__", {})
        self.base_globals = base_globals
        self.guarded = {}  # class -> snapshot
        self.statements = {}  # class -> the class statement it was verified against
        self.cls = None  # the env class, once `loaded`
        self.base_snapshot = (self._snapshot(base), dict(base_globals))

    @staticmethod
    def _snapshot(cls, behaviour_only=False):
        """What a patch could change of `cls`: its bases and its attributes (with
        `behaviour_only`, those that act: functions, descriptors, callables; an env's own data,
        such as a class-level counter, may change as it plays)."""
        return {"__bases__": (_bases(cls),), **{
            key: _parts(value) for key, value in _vars(cls).items()
            if not behaviour_only or _acts(value)}}

    def _body_codes(self, node):
        """The code objects the class statement `node` compiled: its body and what is in it."""
        line = min([node.lineno] + [d.lineno for d in node.decorator_list])
        bodies = [c for c in self.code.co_consts if type(c) is CodeType
                  and c.co_name == node.name and c.co_firstlineno == line]
        if len(bodies) != 1:
            raise EnvClassError(f"the class statement of {node.name} was not compiled as written")
        return bodies[0], {c for c in bodies[0].co_consts if type(c) is CodeType}

    def _verify(self, cls, node):
        """`cls` is what class statement `node` built: a plain class (no metaclass) defining none
        of CLASS_HOOKS, whose functions are that statement's, run in this module's namespace,
        and whose bases are the ones named, each a module class statement's, ToolUseBaseEnv or
        object (the static rules of `shape_problem`, held on what the module built)."""
        name = node.name
        if not isinstance(cls, type):
            raise EnvClassError(f"{name} is not a class after the module ran: it was bound again "
                                "after its class statement")
        if type(cls) is not type:
            raise EnvClassError(f"{name} was built by the metaclass {_name_of(type(cls))}: the "
                                "env's classes are plain classes")
        bases = _bases(cls)
        if not node.bases and bases != (object,):
            raise EnvClassError(f"{name}'s bases were changed after its class statement")
        if node.bases and len(bases) != len(node.bases):
            raise EnvClassError(f"{name}'s bases are not the ones its class statement names")
        body, codes = self._body_codes(node)
        own = _vars(cls)
        for key, value in own.items():
            if key in CLASS_HOOKS and not _made_by_type(cls, key, value):
                raise EnvClassError(f"{name} defines {key}, which lets the class that is played "
                                    "differ from the class that is checked")
            for function in _functions(value):
                if _code(function) not in codes or _globals(function) is not self.namespace:
                    raise EnvClassError(f"{name}.{key} is not the one its class statement "
                                        f"defined (line {node.lineno}): a method was replaced "
                                        "or added after the class was built")
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and not item.decorator_list and item.name not in own:
                raise EnvClassError(f"{name}.{item.name} was removed after the class was built")
        classes = {n.name: n for n in self.tree.body if isinstance(n, ast.ClassDef)}
        for written, actual in zip(node.bases, bases):
            base = written.id if isinstance(written, ast.Name) else None
            if base == BASE_NAME and actual is self.base or base == "object" and actual is object:
                continue
            if base in classes and base not in (BASE_NAME, "object"):
                self._verify(actual, classes[base])
                continue
            raise EnvClassError(f"{name}'s base {ast.unparse(written)} is not a class statement "
                                "of this module, the ToolUseBaseEnv the jail provides or object")
        self.guarded[cls] = self._snapshot(cls, behaviour_only=True)
        self.statements[cls] = node

    def _check_calls(self, cls):
        """Every method the worker or the base class calls on an instance of `cls` (CALLED,
        tool_<name>, and the base's own methods) is, where a module class holds it, the function
        its class statement defines under that very name: never an alias, a descriptor or a
        function stored there after the class was built (the base's own are `check`'s). No
        module class holds a `sealed` name (the base's internals) in a class that inherits the
        base."""
        mro = _mro(cls)
        sealed = self.sealed if self.base in mro else frozenset()
        names = {*CALLED, *sealed, *(key for key, value in _vars(self.base).items()
                                     if type(value) is FunctionType)}
        names.update(key for klass in mro for key in _vars(klass)
                     if type(key) is str and key.startswith("tool_"))
        for name in sorted(names):
            owner = next((klass for klass in mro if name in _vars(klass)), None)
            if owner not in self.statements:
                continue  # the base's own (snapshot-checked), object's, or none: AttributeError
            value = _vars(owner)[name]
            if _made_by_type(owner, name, value):
                continue  # a slot of its own instances, not a method
            if name in sealed:
                raise EnvClassError(f"{_name_of(owner)} redefines ToolUseBaseEnv.{name}: a "
                                    "tool-use env never redefines the base class's internals")
            function = value.__func__ if type(value) in (staticmethod, classmethod) else value
            if type(function) is not FunctionType or _code(function).co_name != name:
                raise EnvClassError(f"{_name_of(owner)}.{name} is not a method its class "
                                    f"statement defines as `def {name}`: what the worker calls "
                                    "is defined by name in a class body")

    def loaded(self):
        """The env class, verified; raises EnvClassError."""
        if self.problem is not None:
            raise self.problem
        cls = self.namespace.get(self.node.name)
        self._verify(cls, self.node)
        self._check_calls(cls)
        self.cls = cls
        self.check()
        return cls

    def check(self, env=None):
        """Raise EnvClassError if a guarded class, the base class or its module changed, or if
        `env` has an attribute of its own that hides a method of its class."""
        if env is not None:
            if type(env) is not self.cls:
                raise EnvClassError(f"the env is now an instance of {_name_of(type(env))}, not of "
                                    f"{self.node.name}: an object keeps the class it was built "
                                    "with (an assignment to __class__, or a constructor that "
                                    "builds another class)")
            self._check_instance(env)
        for cls, snapshot in self.guarded.items():
            now = self._snapshot(cls, behaviour_only=True)
            if not _same(snapshot, now):
                raise EnvClassError(f"{_name_of(cls)} changed after its class statement: "
                                    f"{self._what_changed(snapshot, now)}")
        base, base_globals = self.base_snapshot
        if not _same(base, self._snapshot(self.base)):
            raise EnvClassError("ToolUseBaseEnv changed: "
                                f"{self._what_changed(base, self._snapshot(self.base))}")
        now = dict(self.base_globals)
        if len(now) != len(base_globals) or any(now.get(k, now) is not v
                                                for k, v in base_globals.items()):
            raise EnvClassError("the module of ToolUseBaseEnv was changed")

    @staticmethod
    def _check_instance(env):
        """No attribute of the instance itself shadows behaviour its class (or a base) defines:
        what is played is the class's method, not a function the env stored in its place."""
        try:
            own = object.__getattribute__(env, "__dict__")
        except AttributeError:  # __slots__: nothing of its own can shadow a method
            return
        if type(own) is not dict:
            raise EnvClassError("the env instance's __dict__ is not a dict")
        classes = _mro(type(env))[:-1]  # object's own slots are no env behaviour
        for key in list(own):
            if type(key) is not str:
                continue
            for cls in classes:
                namespace = _vars(cls)
                if key in namespace and _acts(namespace[key]):
                    raise EnvClassError(
                        f"{_name_of(type(env))}.{key} is hidden by an attribute of the instance "
                        f"(self.{key} = ...): define the method in the class body instead")

    @staticmethod
    def _what_changed(before, after):
        for key in sorted({*before, *after}):
            if key not in after:
                return f"{key} was removed"
            if key not in before:
                return f"{key} was added"
            if not _same({key: before[key]}, {key: after[key]}):
                return f"{key} was replaced"
        return "it was changed"
