"""Samples as users have them (.npz files, folders and globs of them, Polygraphy's
--data-loader-script and --save-inputs JSON), streamed: read one at a time, held in memory
only up to a budget, the rest on disk."""
