"""A tiny agent for the task-folder example: it works on files in the attempt's working directory."""

from pathlib import Path


def solve(task: str, workdir: str) -> str:
    """Greets the name in name.txt, or sums the numbers in numbers.txt."""
    work = Path(workdir)
    if (work / "name.txt").exists():
        name = (work / "name.txt").read_text().strip()
        (work / "hello.txt").write_text(f"Hello, {name}!\n")
        return f"wrote hello.txt for {name}"
    numbers = [int(n) for n in (work / "numbers.txt").read_text().split()]
    (work / "total.txt").write_text(f"{sum(numbers)}\n")
    return f"the total is {sum(numbers)}"
