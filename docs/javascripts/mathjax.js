// MathJax for pymdownx.arithmatex (generic mode). MathJax typesets once it has loaded; a
// page the theme swaps in without a reload (document$) is typeset again. No clearCache():
// it drops the CSS of the characters already typeset, whose equations then show blank
// (seen in a headless Chromium by .ci/check_math.py).
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex"
  },
  startup: { typeset: false }
};

document$.subscribe(() => {
  MathJax.startup.promise.then(() => {
    MathJax.typesetClear()
    MathJax.texReset()
    return MathJax.typesetPromise()
  })
})
