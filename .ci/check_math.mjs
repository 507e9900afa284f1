// Every equation of the built site typeset in a headless Chromium with the network off.
//
//   node .ci/check_math.mjs SITE OUT
//
// Serves SITE (the output of `mkdocs build`) on 127.0.0.1, opens every page that holds an
// equation (the others are read by check_math.py's static pass) in a headless
// Chromium that refuses every request to another host (the network is off for the page),
// lets the page typeset its equations as it does for a reader and counts, per page: the
// equations (`.arithmatex` elements), those MathJax typeset (an `mjx-container` inside),
// those left as raw TeX, the TeX errors (`mjx-merror`: an undefined macro, an unbalanced
// brace), those typeset but drawn as nothing (every character of zero width: the CSS of
// the characters missing) and the requests refused. Writes OUT/math.json and a screenshot
// of the three pages with the most equations; exits 1 when an equation is raw, in error or
// blank, or when a page asked for another host.
//
// The browser is @sparticuz/chromium (a Chromium build shipped inside its npm package, so
// it installs from the npm registry alone) driven by puppeteer-core; `.ci/check_math.py`
// installs both and runs this script.
import { createServer } from "node:http";
import { readFile, readdir, mkdir, writeFile } from "node:fs/promises";
import { extname, join, relative, resolve } from "node:path";
import chromium from "@sparticuz/chromium";
import puppeteer from "puppeteer-core";

const [site, out] = process.argv.slice(2).map((p) => resolve(p));
if (!site || !out) {
  console.error("usage: node .ci/check_math.mjs SITE OUT");
  process.exit(2);
}

const TYPES = {
  ".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".png": "image/png",
  ".svg": "image/svg+xml", ".woff": "font/woff", ".woff2": "font/woff2", ".json": "application/json",
};

async function* htmlFiles(dir) {
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) yield* htmlFiles(path);
    else if (entry.name.endsWith(".html") && entry.name !== "404.html") yield path;
  }
}

const server = createServer(async (request, response) => {
  let path = join(site, decodeURIComponent(new URL(request.url, "http://x").pathname));
  if (path.endsWith("/")) path = join(path, "index.html");
  try {
    const body = await readFile(path);
    response.writeHead(200, { "Content-Type": TYPES[extname(path)] ?? "application/octet-stream" });
    response.end(body);
  } catch {
    response.writeHead(404);
    response.end();
  }
});
await new Promise((done) => server.listen(0, "127.0.0.1", done));
const origin = `http://127.0.0.1:${server.address().port}`;

const browser = await puppeteer.launch({
  args: chromium.args, executablePath: await chromium.executablePath(), headless: true,
});
const pages = [];
let withoutMath = 0;  // pages with no equation: the static pass (check_math.py) reads them
for await (const file of htmlFiles(site)) {
  if ((await readFile(file, "utf8")).includes("arithmatex")) pages.push(relative(site, file));
  else withoutMath++;
}
pages.sort();

const report = [];
const page = await browser.newPage();
await page.setViewport({ width: 1200, height: 900 });
await page.setRequestInterception(true);
let refused = [];
page.on("request", (r) => {
  if (r.url().startsWith(origin) || r.url().startsWith("data:")) r.continue();
  else { refused.push(r.url()); r.abort(); }
});
for (const path of pages) {
  refused = [];
  await page.goto(`${origin}/${path}`, { waitUntil: "networkidle0" });
  const counts = await page.evaluate(async () => {
    // the page's own typesetting, not ours: wait (at most 20 s) until every equation has
    // its output, then for the fonts it asked for
    const equations = [...document.querySelectorAll(".arithmatex")];
    const done = () => equations.every((e) => e.querySelector("mjx-container"));
    for (let t = 0; equations.length && !done() && t < 200; t++) await new Promise((d) => setTimeout(d, 100));
    await document.fonts.ready;
    const raw = equations.filter((e) => !e.querySelector("mjx-container"));
    const errors = [...document.querySelectorAll("mjx-merror")];
    // typeset but drawn as nothing: a visible equation none of whose characters has a width
    const blank = [...document.querySelectorAll("mjx-container")].filter((c) => {
      const chars = [...c.querySelectorAll("mjx-c")];
      return c.offsetParent !== null && chars.length && chars.every((x) => x.getBoundingClientRect().width === 0);
    });
    return {
      equations: equations.length,
      typeset: equations.length - raw.length,
      raw: raw.length,
      errors: errors.length,
      blank: blank.length,
      examples: [
        ...raw.slice(0, 3).map((e) => `raw: ${e.textContent.slice(0, 80)}`),
        ...errors.slice(0, 3).map((e) => `error: ${e.getAttribute("data-mjx-error") ?? e.textContent}`),
        ...blank.slice(0, 3).map((e) => `blank: ${e.querySelector("mjx-assistive-mml")?.textContent.slice(0, 80)}`),
      ],
    };
  });
  report.push({ page: path, ...counts, refused: refused.length, refused_urls: refused.slice(0, 3) });
}

await mkdir(out, { recursive: true });
const shots = report.filter((r) => r.equations > 0).sort((a, b) => b.equations - a.equations).slice(0, 3);
for (const r of shots) {
  await page.goto(`${origin}/${r.page}`, { waitUntil: "networkidle0" });
  await page.evaluate(async () => {
    const equations = [...document.querySelectorAll(".arithmatex")];
    for (let t = 0; !equations.every((e) => e.querySelector("mjx-container")) && t < 200; t++) {
      await new Promise((d) => setTimeout(d, 100));
    }
    await document.fonts.ready;
    document.querySelector(".arithmatex")?.scrollIntoView({ block: "center" });
  });
  r.screenshot = `${r.page.replaceAll("/", "_").replace(/\.html$/, "")}.png`;
  await page.screenshot({ path: join(out, r.screenshot) });
}
await browser.close();
server.close();

const total = (key) => report.reduce((s, r) => s + r[key], 0);
const summary = {
  pages: report.length + withoutMath,
  pages_opened: report.length,
  pages_with_math: report.filter((r) => r.equations > 0).length,
  equations: total("equations"),
  typeset: total("typeset"),
  raw: total("raw"),
  errors: total("errors"),
  blank: total("blank"),
  refused_requests: total("refused"),
  screenshots: shots.map((r) => r.screenshot),
};
await writeFile(join(out, "math.json"), JSON.stringify({ summary, pages: report }, null, 1));
for (const r of report.filter((r) => r.raw || r.errors || r.blank || r.refused)) {
  console.log(`${r.page}: ${r.raw} raw, ${r.errors} in error, ${r.blank} blank, ${r.refused} refused`, r.examples, r.refused_urls);
}
console.log(JSON.stringify(summary));
process.exit(summary.raw || summary.errors || summary.blank || summary.refused_requests ? 1 : 0);
