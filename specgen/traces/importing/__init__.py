"""Import of real reasoning logs as replayable traces (`specgen trace import`); the formats and
rules are in `importer`'s docstring."""
from specgen.traces.importing.importer import (
    CHARS_PER_TOKEN,
    MAX_RECORD_MB,
    ImportedTrace,
    ImportInterrupted,
    TraceImportError,
    TraceImportWarning,
    embedded_sources,
    import_traces,
    import_traces_detailed,
)
