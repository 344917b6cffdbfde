// Renders the trajectories of the JSON blob #ragen-data (inlined by ragen_jax/viewer.py).
// Model text only ever reaches the page through textContent, so it can never become markup;
// a frame only through an <img>'s src, and only as the PNG data URI viewer.py checked.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("ragen-data").textContent);
  var episodes = data.episodes;
  var visible = [];   // indices into `episodes` that pass the filters
  var current = -1;   // index into `episodes` shown now

  function $(id) { return document.getElementById(id); }

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function num(x) {
    // Rounds float noise away (-0.30000000000000004 reads -0.3); keeps the sign visible.
    if (x === null || x === undefined) return "n/a";
    var r = +x.toFixed(4);
    return (r > 0 ? "+" : "") + r;
  }

  function outcome(ep) {
    if (ep.success === true) return ["ok", "success"];
    if (ep.success === false) return ["fail", "failure"];
    return ["", "outcome unknown"];
  }

  function describe(ep) {
    var parts = [ep.env || "env ?"];
    if (ep.seed !== null) parts.push("seed " + ep.seed);
    if (ep.group_id !== null) parts.push("group " + ep.group_id);
    if (ep.episode !== null) parts.push("episode " + ep.episode);
    return parts.join(" \u00b7 ");
  }

  function buildFilters() {
    var envs = [];
    episodes.forEach(function (ep) { if (envs.indexOf(ep.env) < 0) envs.push(ep.env); });
    envs.sort().forEach(function (name) {
      var opt = el("option", null, name);
      opt.value = name;
      $("env-filter").appendChild(opt);
    });
    var lines = envs.map(function (name) {
      var eps = episodes.filter(function (ep) { return ep.env === name; });
      var ok = eps.filter(function (ep) { return ep.success === true; }).length;
      return name + " " + ok + "/" + eps.length;
    });
    $("stats").textContent = episodes.length + " trajectories; successes: " + lines.join(", ");
  }

  function buildList() {
    var list = $("list");
    episodes.forEach(function (ep, i) {
      var item = el("li", outcome(ep)[0], (i + 1) + ". " + describe(ep) + " \u00b7 " +
                    num(ep.reward));
      item.id = "item-" + i;
      item.title = outcome(ep)[1];
      item.addEventListener("click", function () { go(i); });
      list.appendChild(item);
    });
  }

  function applyFilters() {
    var env = $("env-filter").value, result = $("result-filter").value;
    visible = [];
    episodes.forEach(function (ep, i) {
      var keep = (env === "" || ep.env === env) &&
          (result === "" || (result === "success") === (ep.success === true));
      $("item-" + i).style.display = keep ? "" : "none";
      if (keep) visible.push(i);
    });
  }

  function renderTurn(step) {
    var card = el("section", "card turn");
    var head = el("h3", null, "Turn " + step.turn);
    if (step.reward !== null) {
      var sign = step.reward < 0 ? "neg" : step.reward > 0 ? "pos" : "";
      head.appendChild(el("span", "reward " + sign, "reward " + num(step.reward)));
    }
    if (step.actions_left !== null) {
      head.appendChild(el("span", "reward", step.actions_left + " actions left"));
    }
    card.appendChild(head);
    if (step.saw) {  // a context window: what this turn's prompt held
      var shown = step.saw.first === null || step.saw.first > step.saw.last ? "no earlier turn" :
          step.saw.first === step.saw.last ? "turn " + step.saw.first :
          "turns " + step.saw.first + "\u2013" + step.saw.last;
      card.appendChild(el("div", "muted", "Saw: the system prompt, " + shown +
                          (step.saw.memory ? ", the memory below" : "") + " and this state"));
      if (step.saw.memory) {
        var mem = el("details");
        mem.appendChild(el("summary", null, "memory (stands in for earlier turns)"));
        mem.appendChild(el("pre", null, step.saw.memory));
        card.appendChild(mem);
      }
    }
    var cols = el("div", "cols");
    var left = el("div"), right = el("div");
    if (step.frame) {  // a visual environment: the image the model saw (a checked data URI)
      left.appendChild(el("div", "label", "Image"));
      var img = el("img", "frame");
      img.alt = "turn " + step.turn + " image";
      img.src = step.frame;
      left.appendChild(img);
    }
    left.appendChild(el("div", "label", "State"));
    left.appendChild(el("pre", "state", step.state));
    if (step.reply === null) {
      right.appendChild(el("div", "muted", "no reply: the episode ended before this turn"));
    } else if (step.think === null && step.answer === null) {
      right.appendChild(el("div", "label bad", "Reply did not parse (raw text)"));
      right.appendChild(el("pre", "raw", step.reply === "" ? "(empty reply)" : step.reply));
    } else {
      right.appendChild(el("div", "label", "Reasoning"));
      if (step.think === null) {
        right.appendChild(el("div", "muted", "no <think>...</think> before the answer"));
      } else {
        right.appendChild(el("div", "think", step.think === "" ? "(empty)" : step.think));
      }
      right.appendChild(el("div", "label", "Answer"));
      var answer = el("div", "answer");
      step.actions.forEach(function (a) { answer.appendChild(el("span", "action", a)); });
      if (!step.actions.length) answer.appendChild(el("span", "muted", "(no actions)"));
      right.appendChild(answer);
      var raw = el("details");
      raw.appendChild(el("summary", null, "raw reply"));
      raw.appendChild(el("pre", null, step.reply));
      right.appendChild(raw);
    }
    cols.appendChild(left);
    cols.appendChild(right);
    card.appendChild(cols);
    return card;
  }

  function render(i) {
    var ep = episodes[i], view = $("view"), res = outcome(ep);
    view.textContent = "";
    var head = el("section", "card");
    head.appendChild(el("h2", null, "Trajectory " + (i + 1) + ": " + describe(ep)));
    var badges = el("div", "badges");
    badges.appendChild(el("span", "badge " + res[0], res[1]));
    badges.appendChild(el("span", "badge", "return " + num(ep.reward)));
    var turns = ep.turns === null ? ep.steps.length : ep.turns;
    badges.appendChild(el("span", "badge", turns + " turns"));
    if (ep.window !== null) {
      badges.appendChild(el("span", "badge", "window: last " + ep.window + " turns"));
    }
    badges.appendChild(el("span", "badge" + (ep.context_truncated ? " warn" : ""),
                          "context truncated: " + (ep.context_truncated ? "yes" : "no")));
    head.appendChild(badges);
    if (ep.system) {
      var sys = el("details");
      sys.appendChild(el("summary", null, "system prompt"));
      sys.appendChild(el("pre", null, ep.system));
      head.appendChild(sys);
    }
    view.appendChild(head);
    ep.steps.forEach(function (step) { view.appendChild(renderTurn(step)); });
    var end = el("section", "card outcome " + res[0]);
    var total = ep.steps.reduce(function (s, t) { return s + (t.reward || 0); }, 0);
    end.appendChild(el("strong", null, "Outcome: " + res[1]));
    end.appendChild(document.createTextNode(
        " \u00b7 return " + num(ep.reward) + " \u00b7 sum of turn rewards " + num(total) +
        (ep.context_truncated ? " \u00b7 stopped early: the next turn did not fit" : "")));
    view.appendChild(end);
  }

  function show(i) {
    if (current >= 0) $("item-" + current).classList.remove("current");
    current = i;
    var item = $("item-" + i);
    item.classList.add("current");
    if (item.scrollIntoView) item.scrollIntoView({block: "nearest"});
    render(i);
    var pos = visible.indexOf(i);
    $("counter").textContent = (pos < 0 ? "-" : pos + 1) + " / " + visible.length +
        (visible.length < episodes.length ? " (of " + episodes.length + ")" : "");
    $("prev").disabled = pos <= 0;
    $("next").disabled = pos < 0 || pos >= visible.length - 1;
    document.title = data.title + " \u2014 " + (i + 1) + " / " + episodes.length;
  }

  // The URL hash (#k, 1-based) names the trajectory, so a page can be linked to one of them.
  function go(i) {
    if (location.hash === "#" + (i + 1)) show(i); else location.hash = "#" + (i + 1);
  }

  function fromHash() {
    var k = parseInt(location.hash.slice(1), 10);
    return k >= 1 && k <= episodes.length ? k - 1 : null;
  }

  function step(delta) {
    var pos = visible.indexOf(current) + delta;
    if (pos >= 0 && pos < visible.length) go(visible[pos]);
  }

  if (!episodes.length) {
    $("view").textContent = "No trajectories in this file.";
    $("counter").textContent = "0 / 0";
    return;
  }
  buildFilters();
  buildList();
  applyFilters();
  ["env-filter", "result-filter"].forEach(function (id) {
    $(id).addEventListener("change", function () {
      applyFilters();
      if (visible.length && visible.indexOf(current) < 0) go(visible[0]); else show(current);
    });
  });
  $("prev").addEventListener("click", function () { step(-1); });
  $("next").addEventListener("click", function () { step(1); });
  document.addEventListener("keydown", function (e) {
    if (e.target.tagName === "SELECT" || e.altKey || e.ctrlKey || e.metaKey) return;
    if (e.key === "ArrowLeft") step(-1);
    if (e.key === "ArrowRight") step(1);
  });
  window.addEventListener("hashchange", function () {
    var i = fromHash();
    if (i === null) return;
    if (visible.indexOf(i) < 0) {  // a link to a filtered-out trajectory clears the filters
      $("env-filter").value = "";
      $("result-filter").value = "";
      applyFilters();
    }
    show(i);
  });
  var first = fromHash();
  show(first === null ? 0 : first);
})();
