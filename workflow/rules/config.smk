# Reading the config, the profile and the registry: each checked against its schema in workflow/schemas/ when the
# workflow is read; a mistake is one `error:` line on stderr and exit code 2, before any job runs.
import jsonschema
from snakemake.utils import validate


def fail(message):
    """A mistake in the config or a profile: one `error:` line on stderr and exit code 2, before any job runs."""
    os.write(2, f"error: {message}\n".encode())
    sys.exit(2)


SCHEMAS = os.path.join(os.path.dirname(workflow.main_snakefile), "schemas")    # workflow/schemas


def checked(data, schema, what):
    """`data` checked against workflow/schemas/<schema> (its defaults filled in); the first problem as one line."""
    schema_file = os.path.join(SCHEMAS, schema)
    with open(schema_file) as handle:
        schema = yaml.safe_load(handle)
    problem = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(data))
    if problem is not None:
        where = ".".join(str(p) for p in problem.absolute_path)
        fail(f"{what}{': ' + where if where else ''}: {problem.message}")
    validate(data, schema_file)
    return data


def read_yaml(path, what):
    try:
        with open(path) as handle:
            return yaml.safe_load(handle)
    except (OSError, yaml.YAMLError) as error:
        fail(f"{what} {path} cannot be read ({str(error).splitlines()[0]})")


def plain_module(path):
    """A module of the package that imports only the standard library and PyYAML (src/symfusion/pipeline/tracks.py,
    src/symfusion/presets/catalog.py), loaded by its path: the workflow reads it without the package being installed
    where Snakemake runs."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded          # dataclasses look their module up by name
    spec.loader.exec_module(loaded)
    return loaded
