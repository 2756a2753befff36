"""What "the FP16 plan agrees with FP32" means: criteria (statistics, task metrics, user
hooks) as data that the search's judge, the written file's judge, the report and the
renderings all read."""
