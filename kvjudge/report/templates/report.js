// The index's only script: sorting and filtering of its tables, on the page itself (no request is made).
"use strict";
(function () {
  function cellValue(row, column) {
    const cell = row.cells[column];
    const raw = cell.dataset.sort !== undefined ? cell.dataset.sort : cell.textContent.trim();
    const number = Number(raw);
    return raw !== "" && !Number.isNaN(number) ? number : raw;
  }

  function compare(x, y) {
    if (x === y) { return 0; }
    if (x === "") { return 1; }           // empty values last, whatever the direction
    if (y === "") { return -1; }
    if (typeof x === "number" && typeof y === "number") { return x - y; }
    return String(x).localeCompare(String(y));
  }

  for (const table of document.querySelectorAll("table.sortable")) {
    const body = table.tBodies[0];
    for (const button of table.querySelectorAll("thead th button")) {
      button.addEventListener("click", function () {
        const header = button.closest("th");
        const column = header.cellIndex;
        const direction = header.getAttribute("aria-sort") === "ascending" ? -1 : 1;
        for (const other of table.querySelectorAll("thead th")) { other.removeAttribute("aria-sort"); }
        header.setAttribute("aria-sort", direction === 1 ? "ascending" : "descending");
        const rows = Array.from(body.rows);
        rows.sort(function (r1, r2) {
          const x = cellValue(r1, column), y = cellValue(r2, column);
          if (x === "" || y === "") { return compare(x, y); }
          return direction * compare(x, y);
        });
        for (const row of rows) { body.appendChild(row); }
      });
    }
  }

  const pairs = document.getElementById("pairs");
  if (!pairs) { return; }
  const rows = Array.from(pairs.tBodies[0].rows);
  const onlyWrong = document.getElementById("only-wrong");
  const onlyInconsistent = document.getElementById("only-inconsistent");
  const task = document.getElementById("task-filter");
  const agent = document.getElementById("agent-filter");
  const shown = document.getElementById("shown-count");

  function apply() {
    let count = 0;
    for (const row of rows) {
      const keep = (!onlyWrong.checked || row.dataset.judged === "wrong")
        && (!onlyInconsistent.checked || row.dataset.outcome === "inconsistent")
        && (task.value === "" || row.dataset.task === task.value)
        && (agent.value === "" || row.dataset.agentA === agent.value || row.dataset.agentB === agent.value);
      row.hidden = !keep;
      if (keep) { count += 1; }
    }
    shown.textContent = count + " of " + rows.length + " pairs shown";
  }

  for (const control of [onlyWrong, onlyInconsistent, task, agent]) {
    control.addEventListener("change", apply);
  }
  apply();
})();
