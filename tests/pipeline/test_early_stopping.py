"""Early stopping in the one training loop (training.fit): `patience` epochs without a better validation score end
the run, the best epoch's weights are kept, a resumed run stops where the uninterrupted one does, and without
patience every epoch runs as before."""
import pytest
import torch

from symfusion.errors import SymfusionError
from symfusion.pipeline.training import adamw, checkpoint_dir, cosine_schedule, fit

# validation losses by epoch (lower is better): the best so far is epoch 2, then 2 epochs without a lower one
SCRIPT = [3.0, 2.0, 2.5, 2.0, 1.0, 0.5]


def run(output, patience, done=0, interrupt_at=None):
    """A tiny linear model trained by fit on random data for len(SCRIPT) epochs; validate() returns SCRIPT's loss of
    the epoch it scores (`done`: epochs a resumed run's checkpoint holds) and records the weights it scored."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    inputs = torch.randn(32, 4)
    generator = torch.Generator().manual_seed(0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, inputs.sum(dim=1, keepdim=True)),
                                         batch_size=8, shuffle=True, generator=generator)
    optimizer = adamw(model, 1e-2, 0.0)
    scheduler = cosine_schedule(optimizer, len(SCRIPT) * len(loader), 0.1)
    scored = []

    def batch_loss(batch):
        return torch.nn.functional.mse_loss(model(batch[0]), batch[1])

    def validate(model):
        epoch = done + len(scored) + 1
        if epoch == interrupt_at:
            raise KeyboardInterrupt
        scored.append({k: v.clone() for k, v in model.state_dict().items()})
        return SCRIPT[epoch - 1], {"validation_loss": SCRIPT[epoch - 1]}

    fitted = fit(output, model, optimizer, scheduler, loader, batch_loss, validate, len(SCRIPT), "toy", generator,
                 "loss", maximize=False, patience=patience)
    return fitted, model, scored


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_patience_stops_the_run_and_keeps_the_best_epoch(tmp_path):
    fitted, model, scored = run(tmp_path / "m", patience=2)
    assert [h["validation_loss"] for h in fitted.history] == SCRIPT[:4]      # epochs 3 and 4 no lower than epoch 2
    assert (fitted.best_epoch, fitted.best_score, fitted.stopped_early) == (2, 2.0, True)
    assert len(scored) == 4 and same(model.state_dict(), scored[1]) and not same(scored[1], scored[3])


def test_without_patience_every_epoch_runs_and_the_best_is_kept(tmp_path):
    fitted, model, scored = run(tmp_path / "m", patience=None)
    assert len(fitted.history) == len(SCRIPT) == len(scored) and not fitted.stopped_early
    assert fitted.best_epoch == 6 and same(model.state_dict(), scored[5])
    wide, _, _ = run(tmp_path / "w", patience=3)                              # patience never spent: the same run
    assert wide.history == fitted.history and wide.best_epoch == 6 and not wide.stopped_early


def test_an_interrupted_run_resumes_and_stops_where_the_uninterrupted_one_does(tmp_path):
    full, full_model, _ = run(tmp_path / "full", patience=2)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "resumed", patience=2, interrupt_at=4)
    assert checkpoint_dir(tmp_path / "resumed").is_dir()
    resumed, model, scored = run(tmp_path / "resumed", patience=2, done=3)
    assert resumed.resumed_after_epoch == 3 and len(scored) == 1 and resumed.history == full.history
    assert resumed.best_epoch == 2 and resumed.stopped_early and same(model.state_dict(), full_model.state_dict())
    # a checkpoint whose patience is already spent (written after epoch 4 by a run killed before it returned) ends
    # the resumed run at once, with the best epoch's weights
    again, model, scored = run(tmp_path / "full", patience=2, done=4)
    assert again.resumed_after_epoch == 4 and scored == [] and again.stopped_early
    assert again.best_epoch == 2 and same(model.state_dict(), full_model.state_dict())


@pytest.mark.parametrize("patience", [0, -1, 1.5, True])
def test_a_patience_that_is_no_positive_count_is_refused(tmp_path, patience):
    with pytest.raises(SymfusionError, match="patience"):
        run(tmp_path / "m", patience=patience)
