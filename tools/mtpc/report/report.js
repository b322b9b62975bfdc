(function () {
  'use strict';
  var tip = document.getElementById('tip');
  function fmt(v, d) {
    if (v === null || v === undefined || !isFinite(v)) return '–';
    return Number(v.toPrecision(d || 5)).toString();
  }
  function smoothed(y, w) {
    var out = [], last = 0, n = 0;
    for (var i = 0; i < y.length; i++) {
      if (y[i] === null) { out.push(null); continue; }
      last = last * w + (1 - w) * y[i]; n++;
      out.push(last / (1 - Math.pow(w, n)));
    }
    return out;
  }
  function pathOf(c, y) {
    var b = c.box, m = c.dom, d = '', pen = false, pts = 0;
    for (var i = 0; i < y.length; i++) {
      if (y[i] === null || !isFinite(y[i])) { pen = false; continue; }
      var px = b[0] + (c.x[i] - m[0]) / (m[1] - m[0]) * b[2];
      var py = b[1] + b[3] - (y[i] - m[2]) / (m[3] - m[2]) * b[3];
      d += (pen ? 'L' : (d ? ' M' : 'M')) + px.toFixed(2) + ',' + py.toFixed(2);
      pen = true; pts++;
    }
    return pts === 1 ? d + 'h0.01' : d;
  }
  var charts = [];
  document.querySelectorAll('svg.chart').forEach(function (svg) {
    var src = document.getElementById(svg.dataset.src);
    if (!src) return;
    var c = JSON.parse(src.textContent);
    c.svg = svg; c.view = c.s.map(function (s) { return s.y; });
    charts.push(c);
    var cursor = svg.querySelector('.cursor');
    var dots = svg.querySelectorAll('.dot');
    function hide() {
      tip.style.display = 'none';
      cursor.setAttribute('visibility', 'hidden');
      dots.forEach(function (d) { d.setAttribute('visibility', 'hidden'); });
    }
    svg.addEventListener('mouseleave', hide);
    svg.addEventListener('mousemove', function (e) {
      var p = svg.createSVGPoint(); p.x = e.clientX; p.y = e.clientY;
      var q = p.matrixTransform(svg.getScreenCTM().inverse());
      var b = c.box, m = c.dom;
      if (q.x < b[0] || q.x > b[0] + b[2]) { hide(); return; }
      var step = m[0] + (q.x - b[0]) / b[2] * (m[1] - m[0]);
      var lo = 0, hi = c.x.length - 1;
      while (hi - lo > 1) { var mid = (lo + hi) >> 1; if (c.x[mid] < step) lo = mid; else hi = mid; }
      var i = Math.abs(c.x[lo] - step) <= Math.abs(c.x[hi] - step) ? lo : hi;
      var x = b[0] + (c.x[i] - m[0]) / (m[1] - m[0]) * b[2];
      cursor.setAttribute('x1', x); cursor.setAttribute('x2', x);
      cursor.setAttribute('visibility', 'visible');
      var rows = ['<b>step ' + c.x[i] + '</b>'];
      c.s.forEach(function (s, k) {
        var v = c.view[k][i];
        var dot = dots[k];
        if (s.raw || v === null || v === undefined) { dot.setAttribute('visibility', 'hidden'); }
        else {
          var y = b[1] + b[3] - (v - m[2]) / (m[3] - m[2]) * b[3];
          y = Math.max(b[1], Math.min(b[1] + b[3], y));
          dot.setAttribute('cx', x); dot.setAttribute('cy', y);
          dot.setAttribute('visibility', 'visible');
        }
        if (s.raw) return;
        var text = fmt(v, s.d) + (c.unit ? ' ' + c.unit : '');
        if (s.sm >= 0) text = fmt(c.s[s.sm].y[i], s.d) + ' (smoothed ' + fmt(v, s.d) + ')';
        rows.push('<i style="background:' + s.c + '"></i>' + s.n + ': ' + text);
      });
      tip.innerHTML = rows.join('<br>');
      tip.style.display = 'block';
      var tx = e.clientX + 14, ty = e.clientY + 12;
      if (tx + tip.offsetWidth > window.innerWidth - 4) tx = e.clientX - tip.offsetWidth - 14;
      if (ty + tip.offsetHeight > window.innerHeight - 4) ty = e.clientY - tip.offsetHeight - 12;
      tip.style.left = tx + 'px'; tip.style.top = ty + 'px';
    });
  });
  // Loss smoothing.
  var slider = document.getElementById('smooth-slider');
  if (slider) {
    var label = document.getElementById('smooth-label');
    var apply = function () {
      var w = Number(slider.value);
      label.textContent = w.toFixed(2);
      charts.forEach(function (c) {
        var paths = c.svg.querySelectorAll('path.series');
        c.s.forEach(function (s, k) {
          if (s.sm < 0 || !paths[k]) return;
          c.view[k] = smoothed(c.s[s.sm].y, w);
          paths[k].setAttribute('d', pathOf(c, c.view[k]));
        });
      });
    };
    slider.addEventListener('input', apply);
  }
  // The cosine heat map over the measured steps.
  var cos = document.getElementById('cos-slider');
  var cosData = document.getElementById('data-cosine');
  if (cos && cosData) {
    var d = JSON.parse(cosData.textContent);
    var cells = document.querySelectorAll('#chart-cosine g.cell');
    var color = function (v) {
      if (v === null) return '#ffffff';
      v = Math.max(-1, Math.min(1, v));
      var end = v < 0 ? [0, 114, 178] : [213, 94, 0], t = Math.abs(v);
      return 'rgb(' + end.map(function (e) { return Math.round(247 + (e - 247) * t); }).join(',') + ')';
    };
    cos.addEventListener('input', function () {
      var k = Number(cos.value), m = d.m[k];
      document.getElementById('cos-label').textContent = 'step ' + d.steps[k] +
        (k === d.steps.length - 1 ? ' (latest of ' + d.steps.length + ' measured)' : ' (' + (k + 1) + ' of ' + d.steps.length + ')');
      document.getElementById('chart-cosine').dataset.step = d.steps[k];
      cells.forEach(function (g) {
        var i = Number(g.dataset.i), j = Number(g.dataset.j);
        var v = m[i] && m[i][j] !== undefined ? m[i][j] : null;
        var rect = g.querySelector('rect');
        rect.setAttribute('fill', color(v)); rect.dataset.v = v;
        var t = g.querySelector('text');
        t.textContent = v === null ? '-' : v.toFixed(2);
        t.setAttribute('fill', v !== null && Math.abs(v) > 0.55 ? '#fff' : '#000');
        g.querySelector('title').textContent = d.tasks[i] + ' × ' + d.tasks[j] + ': ' + fmt(v, 6) + ' at step ' + d.steps[k];
      });
    });
  }
})();
