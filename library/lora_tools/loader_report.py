"""What one loader does with a LoRA file (``check``'s finding per loader), and its printout."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Report:
    """What one loader does with the file: dropped file key -> why, and notes."""

    loader: str
    dropped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def drop(self, keys, reason: str) -> None:
        """Record ``keys`` as dropped for ``reason``, unless already dropped for another."""
        for key in keys:
            self.dropped.setdefault(key, reason)


def print_report(report: Report, total: int) -> None:
    """Print the report: every dropped key (of ``total``), under the reason it is dropped for."""
    if not report.dropped:
        print(f"{report.loader}: reads all {total} keys")
    else:
        print(f"{report.loader}: drops {len(report.dropped)} of {total} keys")
        by_reason: dict[str, list[str]] = {}
        for key, reason in report.dropped.items():
            by_reason.setdefault(reason, []).append(key)
        for reason, keys in sorted(by_reason.items(), key=lambda item: sorted(item[1])[0]):
            print(f"  {len(keys)} key{'s' if len(keys) > 1 else ''}: {reason}")
            for key in sorted(keys):
                print(f"    {key}")
    for note in report.notes:
        print(f"  note: {note}")
