/* The "Delta Mirror" pages' script; ui_render.py inlines this file into every page.
   Airflow 3.3 embeds the page in an iframe sandboxed without allow-top-navigation, so target=_top
   links do nothing. The parent is same-origin: push the DAG's URL on its history and tell its
   router (popstate). Times: <time data-ms> shows "2 min ago", the exact UTC time on hover. */
document.addEventListener('click', function (e) {
  var a = e.target.closest && e.target.closest('a.af');
  if (!a || window.parent === window) return;
  try {
    var p = window.parent;
    p.history.pushState(p.history.state, '', a.getAttribute('href'));
    p.dispatchEvent(new PopStateEvent('popstate', {state: p.history.state}));
    e.preventDefault();
  } catch (err) { /* not same-origin: a plain link */ }
});
function ago(ms) {
  var s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 60) return Math.round(s) + ' s ago';
  if (s < 3600) return Math.round(s / 60) + ' min ago';
  if (s < 172800) return Math.round(s / 3600) + ' h ago';
  return Math.round(s / 86400) + ' days ago';
}
function rel() {
  document.querySelectorAll('time[data-ms]').forEach(function (t) {
    t.textContent = ago(Number(t.dataset.ms));
  });
}
rel(); setInterval(rel, 15000);
