"""Many independent tabular models trained as one batched tensor program (STk Tables 3, 4, 6)."""
from topklab.population.trainer import Members, PopulationTrainer

__all__ = ["Members", "PopulationTrainer"]
