# Values on a command line: every value on a rule's command line goes through the shell as one word (`{params.x:q}`,
# `{log:q}`; tests/workflow/test_workflow_safety.py checks that no rule's shell interpolates anything unquoted), and every path reaches
# Hydra as a quoted string, so that a space, comma, bracket, quote or ${ in a path arrives intact.

PLAIN_PATH = re.compile(r"(?=.*/)[A-Za-z0-9_./][A-Za-z0-9_./-]*")    # with a slash: Hydra reads it as a string
PLAIN_NAME = re.compile(r"[a-z][a-z0-9_]*")


def hydra_quote(value):
    """A string as a Hydra override value that Hydra and OmegaConf give back unchanged: as it is when it is a
    plain path or name (readable logs), else single-quoted with its quotes, backslashes and ${ escaped."""
    text = str(value)
    if PLAIN_PATH.fullmatch(text) or (PLAIN_NAME.fullmatch(text) and text not in ("null", "true", "false", "nan", "inf")):
        return text
    text = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)     # OmegaConf: a literal ${
    text = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), text)
    return f"'{text}'"


def hydra_list(values):
    """A list override value, each item quoted: [a,b] -> ['a','b']."""
    return "[" + ",".join(hydra_quote(v) for v in values) + "]"


def hydra_value(value):
    """A value as Hydra's override grammar writes it: dicts as {key:value,...}."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{hydra_value(item)}" for key, item in value.items()) + "}"
    return str(value)


def quoted_input(name=None):
    """A params function: the rule's input `name` (a key or a position; all of its inputs when None) as a quoted
    Hydra value, a list when the input is a list."""
    def value(wildcards, input):
        chosen = input if name is None else input[name] if isinstance(name, int) else getattr(input, name)
        return hydra_quote(chosen) if isinstance(chosen, str) else hydra_list(chosen)
    return value


def quoted_output(wildcards, output):
    """A params function: the rule's first output as a quoted Hydra value."""
    return hydra_quote(output[0])


def quoted_dirname(wildcards, output):
    """A params function: the folder of the rule's first output (eval_dir=) as a quoted Hydra value."""
    return hydra_quote(os.path.dirname(output[0]))


def statistics_option(wildcards, input):
    """symfusion-merge's statistics=[..] for a rule's input.statistics (null when there are none)."""
    return hydra_list(input.statistics) if input.statistics else "null"


