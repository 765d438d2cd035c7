"""The report page's inline stylesheet and script (no external assets, no network)."""

from __future__ import annotations

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"DejaVu Sans",sans-serif;margin:0 24px 48px;
color:#111827;background:#fff}
header{border-bottom:4px solid #16a34a;padding:8px 0}header.failing{border-color:#dc2626}
h1{font-size:22px;margin:8px 0}h2{font-size:18px;margin:24px 0 8px}h3{font-size:15px;margin:12px 0 4px}
code,pre{font-family:"DejaVu Sans Mono",ui-monospace,monospace;font-size:12px}
table{border-collapse:collapse}th,td{padding:3px 8px;text-align:left;vertical-align:top}
table.summary th{background:#f3f4f6;position:sticky;top:0}
table.summary tr{border-bottom:1px solid #e5e7eb}td.num{text-align:right}
td.verdict{color:#4b5563;max-width:520px}table.kv th{color:#4b5563;font-weight:500}
.badge{display:inline-block;border-radius:4px;padding:0 6px;font-size:12px;font-weight:700;
color:#fff;background:#6b7280}.badge.PASS{background:#16a34a}.badge.KNOWN{background:#ca8a04}.badge.FLAKY{background:#9333ea}.badge.UNSUPPORTED{background:#64748b}
.badge.NEW{background:#dc2626}.badge.STALE{background:#7c3aed}
.filters button{margin-right:6px;border:1px solid #d1d5db;background:#fff;border-radius:4px;
padding:2px 8px;cursor:pointer}.filters button.on{background:#e0e7ff}
tr.hidden,section.hidden{display:none}
section.scenario{border-top:1px solid #e5e7eb;margin-top:20px}
.loc{color:#4b5563}ul.runs{margin:4px 0;padding-left:20px}
.banner{margin:6px 0;padding:6px 10px;border-radius:4px;border-left:6px solid}
.banner.refused{background:#fef3c7;border-color:#d97706}
.banner.stall{background:#fee2e2;border-color:#dc2626}
.warn{color:#b91c1c;font-weight:700}.empty{color:#6b7280;font-style:italic}
.finding{margin:10px 0;padding:6px 8px;border:1px solid #e5e7eb;border-radius:4px}
.finding[data-verdict=NEW]{border-color:#dc2626}.finding.stale{border-color:#7c3aed}
.fhead{margin-bottom:4px}.decision{color:#374151;margin-bottom:4px}
table.diff{width:100%;table-layout:fixed}table.diff th{background:#f9fafb}
table.diff td{width:50%;border:1px solid #e5e7eb}
pre{margin:0;white-space:pre-wrap;word-break:break-all;max-height:360px;overflow:auto}
pre span{display:block;min-height:1.2em}pre.left .chg{background:#fee2e2}pre.right .chg{background:#dcfce7}
.expect{color:#b91c1c}.chart{overflow-x:auto}.legend{color:#4b5563;font-size:12px}
.key{border-left:12px solid;padding-left:4px;margin-right:8px}
.stallkey{border-color:#ef4444}.preemptkey{border-color:#dc2626}
.finishkey{border-color:#111827}.wedgekey{border-color:#fecaca}
svg text{font:11px "DejaVu Sans",sans-serif;fill:#374151}
svg .grid{stroke:#e5e7eb}svg .span{stroke-width:1.5;stroke-opacity:.45}
svg .tokens{stroke-width:1.4;fill:none}svg .frames{stroke:#9ca3af;stroke-width:1;fill:none}
svg .stall{fill:#ef4444;fill-opacity:.35;stroke:#dc2626}svg .stall-label{fill:#b91c1c}
svg .error{stroke:#dc2626;stroke-width:2;fill:none}svg .mark{fill:#b91c1c}
svg .refused{fill:#b45309;font-style:italic}svg .preempt{fill:#dc2626}svg .finish{fill:#111827}
svg .wedge{fill:#fecaca;fill-opacity:.6}svg .chart-title{font-weight:700}
"""

JS = """
(function () {
  'use strict';
  function applyFilter(verdict) {
    var rows = document.querySelectorAll('table.summary tbody tr[data-verdict]');
    for (var i = 0; i < rows.length; i++) {
      var show = !verdict || rows[i].getAttribute('data-verdict') === verdict;
      rows[i].classList.toggle('hidden', !show);
    }
    var buttons = document.querySelectorAll('.filters button');
    for (var j = 0; j < buttons.length; j++) {
      buttons[j].classList.toggle('on', buttons[j].getAttribute('data-filter') === verdict);
    }
  }
  function init() {
    var buttons = document.querySelectorAll('.filters button');
    for (var i = 0; i < buttons.length; i++) {
      buttons[i].addEventListener('click', function (event) {
        applyFilter(event.currentTarget.getAttribute('data-filter') || '');
      });
    }
    var series = document.querySelectorAll('svg.timeline g.series');
    document.body.setAttribute('data-series', String(series.length));
  }
  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', init);
  } else {
    init();
  }
})();
"""
